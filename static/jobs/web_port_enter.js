// The page that takes its user into a task's web port posts its form
// itself: it is the owner's own port, or an admin said so on the notice
// before it (jobs/views/access.py web_port). The button is there without
// scripts.
(function () {
  "use strict";
  var form = document.getElementById("web-port-enter");
  if (form && form.hasAttribute("data-autosubmit")) form.submit();
})();
