"""The HTTP edge and the API process's composition: the server, request intake, authentication,
the uvicorn process, and ``compose`` (settings in, running services out)."""
