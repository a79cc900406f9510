"""One trial's life and a sweep's batch: when a plan is measured, the files written, the launch,
the result; and what the terminal shows of them.
"""
