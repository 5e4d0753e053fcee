"""The agent's link to the controller: orders, the link itself, reports, registration and fencing, job status."""
