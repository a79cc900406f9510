"""The files of record of a trial and a sweep: where each lives (TrialPaths, SweepPaths), claiming
a directory, and result.json.
"""
