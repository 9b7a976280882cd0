"""What the test modules share (the fixtures stay in tests/conftest.py, where pytest
finds them):

- lanes: the database lanes, the test settings and the lane markers' rule;
- in_process: the app in the test's process, called over httpx;
- servers: real server processes, one per test or one per lane for a module;
- api: the session API as plain calls, and the bodies and headers tests send;
- waits: waits with a deadline, for a condition or a session's status;
- problems: the problem+json checks;
- sse: the SSE client (streams read in the background) and its frame predicates;
- database, live, cli: table snapshots and rows, live items, the command line;
- browser, fake_openai: headless Chromium for the web view, and a local OpenAI.
"""
