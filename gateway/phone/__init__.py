"""Phone calls: a telephone carrier's media stream as a client of a voice session.

``/v1/phone/CARRIER`` on the gateway's port takes a carrier's WebSocket
(Twilio Media Streams and the carriers that speak it: ``carriers``). The
stream's ``start`` opens a session (or resumes one named by a ``session_id``
parameter) as any client would; the caller's μ-law audio goes to it, its
spoken answers come back as μ-law with a mark after each chunk, the
carrier's mark echoes are the session's playback reports, speech cuts the
answer with a ``clear``, key presses are ``dtmf`` events. docs/phone.md
tells how to wire a number to it.

- ``settings``: the ``--phone-*`` settings; ``carriers``: the table of carriers;
- ``audio``: μ-law in and out of the session's rates (the one converter);
- ``playback``: the marks in flight and what the caller heard (pure);
- ``keypad``: the caller's keys decide calls waiting for approval (pure);
- ``plans``: the numbers file: what session a call gets, and whose it is;
- ``stream_tokens``: one-time tokens an app puts in its TwiML;
- ``admission``: who may open a stream (signatures at the handshake, tokens redeemed);
- ``opening``: a call's start: token, media format, its plan, its session (``CallHost``);
- ``call``: one call's stream, the session's client; ``meter``: what a call measured;
- ``edge``: the calls of a node (handshakes, serve, drain), the server's
  ``gateway.edge.media_streams.MediaStreams``;
- ``control``: the call tools' side (hang up, transfer, keys) and the carrier's REST API;
- ``webhook``: the TwiML helper on the HTTP API's port.
"""
