"""Small asyncio helpers for the rollout loop and plugins: backoff, blocking calls in abandonable threads,
concurrency limits, deadlines, and task pools for CPU-heavy plugin work."""
