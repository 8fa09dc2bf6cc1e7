"""Fault injection on a private broker: the schedule, the disturbed run, the report (`python -m fedat.ops.chaos`)."""
