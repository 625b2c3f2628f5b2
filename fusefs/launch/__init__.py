"""The job launch: one command that readies a node for a job (image, snapshot, checkpoint)
and runs it.
"""
