"""Export: trained embedding tables to a verified CPU serving SavedModel."""
