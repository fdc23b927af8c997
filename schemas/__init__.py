"""Records on the wire and on disk: msgspec Structs and their codecs. Imports nothing else of ours
but the error tree."""

from epochal.schemas.codec import decode, encode

__all__ = ["decode", "encode"]
