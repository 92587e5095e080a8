"""Real test components (zfs-fuse, sshd, moto S3, PostgreSQL) started by pytest fixtures."""
