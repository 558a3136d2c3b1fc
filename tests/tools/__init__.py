"""Tests of the tool hosts and what runs their tools."""
