// Sorting and filtering of the report's tables, and opening an episode when a link points at it.
(function () {
  function cellValue(row, index, numeric) {
    var text = row.cells[index] ? row.cells[index].textContent.trim() : "";
    if (!numeric) return text.toLowerCase();
    var value = parseFloat(text);
    return isNaN(value) ? -Infinity : value;
  }

  function sortBy(table, th) {
    var index = Array.prototype.indexOf.call(th.parentNode.children, th);
    var numeric = th.dataset.type === "num";
    var ascending = !th.classList.contains("asc");
    Array.prototype.forEach.call(th.parentNode.children, function (h) { h.classList.remove("asc", "desc"); });
    th.classList.add(ascending ? "asc" : "desc");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, index, numeric), y = cellValue(b, index, numeric);
      return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1);
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }

  function filter(table, query) {
    var words = query.toLowerCase().split(/\s+/).filter(Boolean);
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var text = row.textContent.toLowerCase();
      var show = words.every(function (w) { return text.indexOf(w) >= 0; });
      row.classList.toggle("hidden", !show);
    });
  }

  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    if (!target) return;
    for (var node = target; node; node = node.parentElement) {
      if (node.tagName === "DETAILS") node.open = true;
    }
    target.scrollIntoView();
  }

  // each page image is embedded once (several samples of a task show the same page)
  var images = JSON.parse(document.getElementById("page-images").textContent);
  document.querySelectorAll("img[data-image]").forEach(function (img) { img.src = images[img.dataset.image]; });

  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.tHead.querySelectorAll("th").forEach(function (th) {
      th.addEventListener("click", function () { sortBy(table, th); });
    });
  });
  document.querySelectorAll("input.filter").forEach(function (input) {
    var table = document.getElementById(input.dataset.filterFor);
    input.addEventListener("input", function () { filter(table, input.value); });
  });
  window.addEventListener("hashchange", openTarget);
  openTarget();
  window.report = { sortBy: sortBy, filter: filter };
})();
