"""A validated trial as the engines read it, as data and without running anything: DeepSpeed's
ds_config (deepspeed.py), Accelerate's config (accelerate.py), what FSDP2's fully_shard is given
(fsdp.py), and EXPLAIN.md's lines on how each value follows from the trial. run/trial_files.py
writes them into a trial's directory, with the launch.
"""
