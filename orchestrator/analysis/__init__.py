"""After trials ran: the report and its plots, calibration of a preset on measured trials, and the
tune search.
"""
