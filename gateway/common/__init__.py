"""The ground floor the server and the client library both stand on.

Pure helpers with no opinion about which side of the socket runs them: PCM16
audio (``pcm``) and the settings machinery that turns one declaration into a
flag, an environment variable and a README row (``settings``). Nothing here
imports anything of ours, so ``gateway.client`` can use it without pulling in
a server room (tests/house/test_layers.py checks both).
"""
