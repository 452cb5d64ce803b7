"""Tool modules. Importing this package registers every tool below it."""

from workers import bench, conformance, example, search_logs, summarize, train_model

__all__ = ["bench", "conformance", "example", "search_logs", "summarize", "train_model"]
