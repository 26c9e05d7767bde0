"""Services: the only code that changes engine state.

Views, admin actions, management commands, the RQ entry and the HTTP API parse
input and call these. Each transition is one conditional write (or one
transaction) whose row count decides whether it happened.
"""
