"""alpineagents_s3: keep alpineagents States in an S3 bucket."""

try:
    import boto3  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "alpineagents_s3 needs boto3 and aioboto3: pip install 'alpineagents[s3]'"
    ) from e

__all__: list[str] = []
