"""Fixtures of the bench tests: the fake OpenAI server (see bench_fake_openai)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from bench_fake_openai import FakeOpenAI, start_fake_openai


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    fake, server = await start_fake_openai()
    yield fake
    fake.close_all()
    server.close()
    await server.wait_closed()
