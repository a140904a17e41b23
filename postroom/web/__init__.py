"""`postroom web`: the console for support and operators, server-rendered with Starlette and
Jinja2. auth (who signs in, with which role), forms (what a request asks, checked), timeline
(one email's life as events) are pure; store talks to the database and the topics; app wires them.
"""
