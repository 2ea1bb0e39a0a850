from __future__ import annotations

app_name = "council"
urlpatterns: list = []
