"""Thin Python client for training jobs talking to s3lanes (or plain S3)."""
