"""Whether a trial can be what it says, before anything starts: a value's own checks (a whole
number, a choice, finite; the typed copy of the composed config), the rules of a trial's fields
one concern at a time, and the cluster group's (placement, the partition's shape).
"""
