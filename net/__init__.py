"""Every listener's transport and bounds: the KT and memcached listeners' TCP server, the
HTTP listeners' bounds over uvicorn, the bounded ASGI body reader, TLS (contexts,
certificates, the replicas' HTTPS transport) and the listeners' metrics.

Imports only `core`: a listener's bounds are the same rules whichever protocol it speaks.
"""
