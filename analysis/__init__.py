"""Owns the store schema and everything that reads it: breakdowns, collectives, stragglers, reports, views."""
