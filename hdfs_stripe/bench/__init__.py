"""`bootseer bench ckpt`: checkpoint reads through the swarm against direct HDFS reads.
Product code never imports this room.
"""
