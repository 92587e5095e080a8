"""One module per store scheme, each declaring its ``Scheme`` (``zrepl_py.stores.registry``):
the URL scheme, its ``[stores.NAME]`` settings, its pip extra, and how it opens its backend.

Scheme modules are import-light (pydantic and the stdlib): validating a config loads every
one of them. A backend whose library is heavy (boto3) lives in its own module
(``zrepl_py.stores.s3``), which the scheme's ``open`` imports when a store is opened.
"""
