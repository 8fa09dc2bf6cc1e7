"""Tier barrier and global aggregator services."""
