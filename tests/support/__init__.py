"""Shared test harness: the tool server in-process, `ctproxy up` as a real process, free ports."""
