"""TaskD's package path for the recover client (re-export modules); the code lives in taskd.client."""
