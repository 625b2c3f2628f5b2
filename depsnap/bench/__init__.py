"""`bootseer bench depsnap`: snapshot restore against a fresh install. Product code never
imports this room.
"""
