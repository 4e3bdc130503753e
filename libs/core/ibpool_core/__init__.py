"""ibpool_core: the pure domain of ibpool. Never imports asyncio, nats, asyncpg or aiohttp."""
