"""The two login forms (the portal's /login/ and the Django admin's), both
under the failed-login limits of jobs/services/ratelimit.py, so neither
page is a way around the other's throttle; and the Django admin's password
change, whose old password is a login to guess too."""

from __future__ import annotations

from django.contrib.admin.forms import AdminAuthenticationForm, AdminPasswordChangeForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from jobs.models import User
from jobs.services import ratelimit


class _RateLimited:
    """Wraps AuthenticationForm.clean in ratelimit.attempt_login."""

    rate_limit_message = ""  # shown by registration/login.html instead of the usual error

    def clean(self):
        try:
            ratelimit.attempt_login(self.request, username=self.data.get("username", ""), check=self._check_password)
        except ratelimit.LoginThrottled as exc:
            self.rate_limit_message = exc.message
            raise ValidationError(exc.message, code="rate_limited") from None
        return self.cleaned_data

    def _check_password(self) -> User | None:
        """The form's own check: the user, None when a field was missing
        (nothing was tried), ValidationError when it failed."""
        super().clean()  # type: ignore[misc]
        return self.get_user()  # type: ignore[attr-defined]


class RateLimitedLoginForm(_RateLimited, AuthenticationForm):
    pass


class RateLimitedAdminLoginForm(_RateLimited, AdminAuthenticationForm):
    pass


class RateLimitedAdminPasswordChangeForm(AdminPasswordChangeForm):
    """The old password is checked under the same limit: a stolen session
    must not be a way to guess it without end."""

    def __init__(self, user: User, *args, request: HttpRequest, **kwargs) -> None:
        super().__init__(user, *args, **kwargs)
        self.request = request

    def clean_old_password(self) -> str:
        def check() -> User:
            super(RateLimitedAdminPasswordChangeForm, self).clean_old_password()
            return self.user

        try:
            ratelimit.attempt_login(self.request, username=self.user.get_username(), check=check)
        except ratelimit.LoginThrottled as exc:
            raise ValidationError(exc.message, code="rate_limited") from None
        return self.cleaned_data["old_password"]
