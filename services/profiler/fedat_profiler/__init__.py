"""Profiler service: latency measurement and tier assignment."""
