"""Test support that ships with the package: the scripted OpenAI-compatible server.

The offline demo and the test suite both talk to it over HTTP with the real `openai` SDK.
"""
