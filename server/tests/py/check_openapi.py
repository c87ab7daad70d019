"""Validates an OpenAPI document (a file path) against the OpenAPI 3.1 schema."""
import json
import sys

from openapi_spec_validator import validate

with open(sys.argv[1]) as f:
    doc = json.load(f)
validate(doc)
print(f"valid OpenAPI {doc['openapi']}: {len(doc['paths'])} paths")
