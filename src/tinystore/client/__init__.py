"""The SDK: :class:`~tinystore.client.store.Store` and one module per engine."""
