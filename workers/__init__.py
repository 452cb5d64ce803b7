"""Tool modules. Importing this package registers every tool below it."""

from workers import bench, conformance, example

__all__ = ["bench", "conformance", "example"]
