"""The front doors: gRPC (service), the LibreTranslate HTTP API with its request reading, glossary routes,
middleware and OpenAPI document, the page, and what every door shares: letting a request in (door) and
binding its listeners (listen). Protobuf and JSON stop here."""
