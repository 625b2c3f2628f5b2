"""hdfs_stripe: reserved; built in its own issue."""
