"""Fault injection: every request ends once, with its own result or a clear error."""
