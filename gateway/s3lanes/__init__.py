"""s3lanes: an S3 gateway for GPU training clusters."""

__version__ = "0.1.0"
