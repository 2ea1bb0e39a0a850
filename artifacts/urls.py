from __future__ import annotations

app_name = "artifacts"
urlpatterns: list = []
