"""The release. The trial keeper carries the same number (a test checks), and the metrics
gateway refuses a keeper whose major.minor differs from it."""

VERSION = "0.1.0"
