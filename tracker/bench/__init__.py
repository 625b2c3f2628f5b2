"""`bootseer bench tracker`: announce load against real trackers. Product code never
imports this room.
"""
