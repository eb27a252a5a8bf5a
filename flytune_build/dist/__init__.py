"""Wheels and sdists, read as installers read them (`wheelfile`, `archive`) and written reproducibly
(`wheel`, `sdist`); the RECORD hash is `wheel.record_hash`, one rule for both directions."""
