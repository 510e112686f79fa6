"""Post-mortem: answers and files made from a recorded event log, without the machine."""
