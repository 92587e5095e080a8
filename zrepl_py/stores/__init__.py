"""Object stores: the ``Backend`` contract (``base``: put, get, stat, list, delete, thaw, with
their error semantics), ``file`` (a directory), ``s3`` (boto3, multipart, storage classes,
thaw), ``retry`` (the one retry policy), ``keys`` (key rules), ``open`` (config -> backend)."""
