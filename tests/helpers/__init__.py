"""Helpers the tests share: waits, real registries, hostile peers, metrics text, images,
local clusters."""
