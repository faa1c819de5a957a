"""The router: input processing, stream choice, admission, XADD."""
