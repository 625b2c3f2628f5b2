"""`python -m hdfs_stripe ...`: `bootseer ckpt ...` without the console script."""

from hdfs_stripe.cli import main

raise SystemExit(main())
