"""Preprocessing: vocabularies, embedding IDs and statistics (Apache Beam)."""
