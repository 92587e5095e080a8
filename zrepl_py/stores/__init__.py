"""Object stores: the ``Backend`` contract (``base``: put, get, stat, list, delete, thaw,
probe, with their error semantics), the ``registry`` of schemes (``schemes/``: one module per
scheme, its URL, keys, pip extra and how it opens; ``scheme``: what one declares;
``settings``: the keys every store has), the backends ``file`` (a directory) and ``s3``
(boto3, multipart, storage classes, thaw), ``prune_credential`` (deletes with another
credential), ``retry`` (the one retry policy), ``keys`` (key rules)."""
