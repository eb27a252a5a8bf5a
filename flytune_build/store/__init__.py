"""Artifact directories as data: canonical form (`canonical.fmt`) and the union of several
(`merge.merge`), each all or nothing."""
