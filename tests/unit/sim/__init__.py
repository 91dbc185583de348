"""Simulator tests: scenarios, physics, exposition, fleet, CLI."""
