"""What every tool shows its user: reports and error lines (report), live progress (progress), and
the errors that stop a run because of its input (errors)."""
