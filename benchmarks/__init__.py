"""Benchmarks, each a module with a function returning rows and a script entry point."""
