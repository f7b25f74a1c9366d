"""Every row counted: independent row counts of inputs (row_counts) and the row ledger (ledger)."""
